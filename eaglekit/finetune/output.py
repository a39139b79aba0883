"""The fine-tuned draft as a folder: the source's layout, config and every untrained tensor byte for byte, trained
tensors in their source dtype; staged, read back as vLLM will read it, judged against its source, and only then
published (eaglekit.io.publish), so a refused, failed or killed write leaves no output.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

from eaglekit.errors import OutputError
from eaglekit.families import load_draft
from eaglekit.finetune.evaluate import Evaluation
from eaglekit.io.dtypes import torch_dtype
from eaglekit.progress import Progress, quiet
from eaglekit.spec import DraftSpec
from eaglekit.target import TargetInfo


def out_tensors(spec: DraftSpec, drafter, trained: set[str]):
    """Every source tensor under its source name: trained ones (canonical names) from the drafter's canonical state,
    where fused q|k|v and gate|up parameters are split back into the checkpoint's tensors; the rest copied
    verbatim."""
    import torch

    from eaglekit.io.writer import ByteRange, OutTensor

    state = drafter.state_dict()
    tensors = []
    for name, ref in sorted(spec.tensors.items(), key=lambda kv: kv[1].source_name):
        if name in trained:
            value = state[name].detach().to("cpu", torch_dtype(ref.dtype))
            if not bool(torch.isfinite(value).all()):
                raise OutputError(f"trained {name} has values that overflow {ref.dtype} (or are not finite): "
                                  "lower --lr or train in fp32", spec.path)

            def chunks(v=value):
                yield v.contiguous().view(torch.uint8).numpy().tobytes()

            tensors.append(OutTensor(ref.source_name, ref.dtype, tuple(ref.shape), chunks))
        else:
            tensors.append(OutTensor(ref.source_name, ref.dtype, tuple(ref.shape),
                                     ByteRange(os.path.join(spec.path, ref.file), ref.data_start, ref.data_end)))
    return tensors


def check_output(path: str, spec: DraftSpec, info: TargetInfo) -> list[dict[str, Any]]:
    """The written draft read back: same flags, ids and tensor set as the source, and vLLM's rules pass."""
    from eaglekit.rules import run_rules

    out = load_draft(path, target=info)
    problems = []
    if out.aux.ids != spec.aux.ids:
        problems.append(f"aux ids read back as {out.aux.ids}, the source has {spec.aux.ids}")
    if out.flags != spec.flags:
        problems.append(f"flags read back as {out.flags}, the source has {spec.flags}")
    if set(out.tensors) != set(spec.tensors):
        problems.append("the tensor set differs from the source's")
    if problems:
        raise OutputError(f"the fine-tuned draft does not read back as written, nothing was written: {problems[0]}",
                          path)
    findings = [f.to_dict() for f in run_rules(out, target=info, engine="vllm").findings]
    errors = [f for f in findings if f["severity"] == "error"]
    if errors:
        raise OutputError(f"the fine-tuned draft fails validation, nothing was written: [{errors[0]['code']}] "
                          f"{errors[0]['message']}", path)
    return findings


Findings = list[dict[str, Any]]


def write_output(destination: str, spec: DraftSpec, drafter, trained: set[str],
                 provenance: Callable[[Evaluation | None], dict[str, Any]], info: TargetInfo, force: bool,
                 judge: Callable[[str], Evaluation | None], progress: Progress | None = None
                 ) -> tuple[list[str], Findings, Evaluation | None]:
    """Write into a staging folder, read it back and validate it, let `judge` measure it against the source (it
    raises to refuse), then publish with the measurement in the provenance. (files, findings, evaluation)."""
    progress = quiet(progress)
    from eaglekit.io.publish import Staged, publish
    from eaglekit.io.writer import write_checkpoint_weights, write_json

    tensors = out_tensors(spec, drafter, trained)

    def write(stage: Staged, evaluation: Evaluation | None = None) -> None:
        block = provenance(evaluation)
        write_checkpoint_weights(stage.path, tensors, {"format": "pt", "eaglekit": json.dumps(block, sort_keys=True)})
        write_json(os.path.join(stage.path, "config.json"), {**spec.config, "eaglekit": block})

    def read_back(stage: Staged) -> tuple[Findings, Evaluation | None]:
        progress.stage("reading the staged output back and validating it")
        findings = check_output(stage.path, spec, info)
        evaluation = judge(stage.path)
        progress.stage("writing the output with its measurement and publishing it")
        if evaluation is not None:  # the same weights, with the measurement in their provenance
            write(stage, evaluation)
        return findings, evaluation

    progress.stage("writing the output (staged)")
    checked = publish(destination, write, replace=force, folder=True, read_back=read_back)
    assert checked is not None, "read_back returns its findings"
    findings, evaluation = checked
    return sorted(os.listdir(destination)), findings, evaluation
