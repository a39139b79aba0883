"""The engine settings a draft needs where no config key can say it: the capture layers of TensorRT-LLM and tokenspeed.

TensorRT-LLM never reads the draft's ids (its `eagle3_layers_to_capture` decides, default {1, N//2-1, N-4}), so
its setting is always given. tokenspeed reads the config but shifts it; its flag is given when that reading
differs from what the draft was trained on, or cannot be told without the target.
"""

from __future__ import annotations

from eaglekit.engines import TOKENSPEED, TRTLLM
from eaglekit.engines.tokenspeed import capture_flag_value, tokenspeed_capture, tokenspeed_view
from eaglekit.engines.trtllm import capture_setting
from eaglekit.spec import DraftSpec
from eaglekit.target import TargetInfo


def engine_settings(spec: DraftSpec, engine: str, target: TargetInfo | None = None) -> tuple[str, ...]:
    """What to pass `engine` beside the checkpoint (empty: the files say everything it reads)."""
    ids = spec.aux.ids
    if not ids:
        return ()
    target = target or spec.target
    if engine == TRTLLM:
        setting = capture_setting(ids)
        return (setting,) if setting else ()
    if engine == TOKENSPEED:
        view = tokenspeed_view(spec, target)
        captured = tokenspeed_capture(view, target)
        if captured is not None and sorted(set(captured)) == sorted(set(ids)):
            return ()
        value = capture_flag_value(ids, view.shifted)
        return (f"--eagle3-layers-to-capture {value}",) if value else ()
    return ()
