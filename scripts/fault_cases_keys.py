"""Fault-probe cases 60-79 (issue 46, round three): what is reused: the journal, the trace cache, the atlas's rows.

Run by scripts/fault-probe with the others; each `case_N(tmp)` returns what
it saw or raises `Verdict` (failed) or `Skip`.
"""

from fault_probe import (B0, README, STEM, Skip, Verdict, check, refused, run,  # noqa: F401
                         search_args, write)
