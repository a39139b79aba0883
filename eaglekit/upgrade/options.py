"""What the caller asks of an upgrade; one object shared by the CLI and the Python API."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from eaglekit.errors import UsageError
from eaglekit.families import eagle3_family_names
from eaglekit.quantization import scheme
from eaglekit.target_model import check_device
from eaglekit.upgrade.dialects import NAMES as DIALECTS
from eaglekit.upgrade.dialects import writes_eagle31, writes_one_file

FC_NORM_INITS = ("ones", "calibrated")
DEFAULT_MAX_SHARD_SIZE = 5 * 1000**3  # the Hugging Face default, "5GB"


@dataclass(frozen=True)
class UpgradeOptions:
    source_family: str = "eagle3"  # "eagle3": detect the layout; else read the source as this family
    target: str | None = None  # target model dir (or its config.json): L, T, V; weights for calibration
    aux_layer_ids: tuple[int, ...] | None = None
    aux_convention: str | None = None  # "input" | "output": how --aux-layer-ids (or unknown source ids) count
    fc_norm: bool | None = None  # None: decided with the target (eagle31_flags)
    norm_output: bool | None = None  # None: decided with the target (eagle31_flags)
    fc_norm_init: str | None = None  # "ones" | "calibrated"; None: calibrated when the target has weights
    calibration_file: str | None = None
    calibration_tokens: int = 2048
    target_quantization: str | None = None  # calibrate on the target as served with these numerics
    to: str = "vllm"
    dtype: str | None = None  # "BF16" | "F16" | "F32"; None: keep each tensor's dtype
    max_shard_size: int = DEFAULT_MAX_SHARD_SIZE
    dry_run: bool = False
    force: bool = False
    allow_pickle: bool = False
    subfolder: str | None = None
    revision: str | None = None
    device: str | None = None  # where the target runs for calibration (None: the CPU)
    store: str | None = None  # calibrate from a capture store: the target's decoder is never loaded

    def check(self) -> None:
        if self.source_family != "eagle3" and self.source_family not in eagle3_family_names():
            raise UsageError(f"--from {self.source_family!r}: expected eagle3 or one of "
                             f"{', '.join(eagle3_family_names())}")
        if self.to not in DIALECTS:
            raise UsageError(f"--to {self.to!r}: expected one of {', '.join(DIALECTS)}")
        if self.aux_convention not in (None, "input", "output"):
            raise UsageError(f"--aux-convention {self.aux_convention!r}: expected input or output")
        if self.fc_norm_init not in (None, *FC_NORM_INITS):
            raise UsageError(f"--fc-norm-init {self.fc_norm_init!r}: expected ones or calibrated")
        if self.fc_norm_init == "calibrated" and not self.target:
            raise UsageError("--fc-norm-init calibrated needs --target (the model whose hidden states it measures)")
        if self.fc_norm_init is not None and self.fc_norm is False:
            raise UsageError("--fc-norm-init has no effect with --no-fc-norm")
        if self.calibration_file and not self.target:
            raise UsageError("--calibration-file needs --target")
        if self.store and not self.target:
            raise UsageError("--store needs --target (its config, tokenizer and embeddings; no decoder layer)")
        if self.store and self.calibration_file:
            raise UsageError("--store holds its own calibration text: capture it with `eaglekit capture TARGET "
                             "STORE --calibration --calibration-file FILE`")
        scheme(self.target_quantization)
        if self.target_quantization and (not self.target or self.lossless or self.fc_norm_init == "ones"):
            raise UsageError(f"--target-quantization {self.target_quantization} sets the numerics calibration runs "
                             "the target with: it needs --target and a calibrated fc_norm or norm_output")
        if self.aux_layer_ids is not None:
            if not self.aux_layer_ids or any(i < 0 for i in self.aux_layer_ids):
                raise UsageError("--aux-layer-ids must be non-negative integers")
            if len(set(self.aux_layer_ids)) != len(self.aux_layer_ids):
                raise UsageError(f"--aux-layer-ids {list(self.aux_layer_ids)} has duplicates (P20)")
        if self.max_shard_size <= 0:
            raise UsageError("--max-shard-size must be positive")
        if writes_one_file(self.to) and self.max_shard_size != DEFAULT_MAX_SHARD_SIZE:
            raise UsageError(f"--max-shard-size with --to {self.to}: it splits a folder's weights into shards, and "
                             f"--to {self.to} writes one file; drop --max-shard-size")
        if self.device is not None:
            check_device(self.device)
        if self.calibration_tokens < 64:
            raise UsageError("calibration needs at least 64 tokens")

    @property
    def eagle31_asked(self) -> bool:
        """Whether the caller asked for EAGLE-3.1 outright (a flag on, or --fc-norm-init): then it is written even
        where nothing can keep the EAGLE-3 function (the untrained start)."""
        return self.fc_norm is True or self.norm_output is True or self.fc_norm_init is not None

    def eagle31_flags(self, calibratable: bool) -> tuple[bool, bool]:
        """(fc_norm, norm_output) to switch on. A flag given is kept; one left unset is on where the output carries
        EAGLE-3.1 and either the target's weights let the upgrade keep the EAGLE-3 function (`calibratable`) or
        the caller asked for 3.1 outright. --fc-norm-init implies fc_norm, and norm_output with it."""
        default = writes_eagle31(self.to) and (calibratable or self.eagle31_asked)
        implied = self.fc_norm_init is not None
        fc_norm = self.fc_norm if self.fc_norm is not None else default or implied
        norm_output = self.norm_output if self.norm_output is not None else default or implied
        return fc_norm, norm_output

    @property
    def lossless(self) -> bool:
        """Whether the options alone make the output keep the function exactly: both flags off, or left to a
        default that has no target to calibrate on."""
        return not any(self.eagle31_flags(calibratable=self.target is not None))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
