"""The resume summary under the name harness/run.py imports it by: records/resume.py reads it (records/ is the one
reader of stored records), and the driver's side of a resume is harness/recorded.py."""

from records.resume import ResumeState

__all__ = ["ResumeState"]
