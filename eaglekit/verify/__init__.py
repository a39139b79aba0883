"""verify: run a draft against its target in a real speculative decode and report acceptance.

    from eaglekit.verify import VerifyOptions, verify
    report = verify("./draft", "./target", VerifyOptions(num_speculative_tokens=3, diagnose=True))
    report.lossless, report.acceptance_length, report.to_dict()

Importing this package does not import torch; the functions that compute do.
"""

from eaglekit.target_model import TargetModel, TargetPass, load_target
from eaglekit.verify.report import VerifyReport
from eaglekit.verify.run import VerifyOptions, verify

__all__ = ["TargetModel", "TargetPass", "VerifyOptions", "VerifyReport", "load_target", "verify"]
