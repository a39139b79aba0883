"""verify: run a draft against its target in a real speculative decode and report acceptance.

    from eaglekit import VerifyOptions
    from eaglekit.verify import verify, verify_conditions
    report = verify("./draft", "./target", VerifyOptions(num_speculative_tokens=3, diagnose=True))
    report.lossless, report.acceptance_length, report.to_dict()
    sweep = verify_conditions("./draft", "./target", VerifyOptions(context_tokens=(0, 1024), template=("chat", "raw")))
    [(r.settings.condition.label, r.acceptance_length) for r in sweep.reports]

Importing this package does not import torch; the functions that compute do.
"""

from eaglekit.target_model import TargetModel, TargetPass, load_target
from eaglekit.verify.report import VerifyReport, VerifySweep
from eaglekit.verify.run import verify, verify_conditions

__all__ = ["TargetModel", "TargetPass", "VerifyReport", "VerifySweep", "load_target", "verify", "verify_conditions"]
