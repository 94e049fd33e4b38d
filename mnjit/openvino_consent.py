"""OpenVINO's usage telemetry, declined where the user has not decided.

Importing openvino (its `openvino.tools.ovc`) sends a usage event, and the openvino-telemetry package sends it
from a forked process (multiprocessing's default start on Linux): JAX, already running, then warns that
`os.fork() was called ... deadlock`. The installed openvino-telemetry honours one opt-out, the consent file
that OpenVINO's documented `opt_in_out --opt_out` writes ($HOME/intel/openvino_telemetry holding "0"); with no
such file it sends without asking (enable_opt_in_dialog=False). mnjit writes that opt-out before its first import
of openvino only where the file does not exist: a user's own decision (`opt_in_out --opt_in` writes "1") is kept,
and JAX's warning is left alone for every other fork.
"""
from __future__ import annotations

import logging
import os

logger = logging.getLogger(__name__)


def decline_unless_decided() -> bool:
    """Writes OpenVINO's telemetry opt-out where no decision is recorded; returns whether it wrote it."""
    try:
        from openvino_telemetry.utils.opt_in_checker import ConsentCheckResult, OptInChecker
    except ImportError:  # openvino without its telemetry package sends nothing
        return False
    checker = OptInChecker()
    if checker.consent_file_base_dir() is None or checker.consent_file_subdirectory() is None:
        return False  # no home folder: the package sends nothing either (it declines)
    if os.path.exists(checker.consent_file()):
        return False
    written = checker.update_result(ConsentCheckResult.DECLINED)
    if written:
        # A warning, not info: the file outlives this process and speaks for the user (once per machine).
        logger.warning("mnjit declined OpenVINO's usage telemetry in %s (OpenVINO's opt-out; `opt_in_out --opt_in` "
                    "enables it)", checker.consent_file())
    return written
