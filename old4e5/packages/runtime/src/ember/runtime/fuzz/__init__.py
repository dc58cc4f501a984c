"""The differential fuzzer: random valid torch programs, ember against eager.

`generate(seed)` makes a program (`program.py` is the data, `generate.py` the choices),
`run_program` compiles and judges it (`run.py`), `shrink` reduces a failure and
`write_reproducer` writes it as a standalone script (`shrink.py`), and `fuzz` runs a
campaign over a range of seeds within a time budget (`campaign.py`;
`python -m ember.runtime.fuzz --help`). Everything is deterministic per seed.
"""

from ember.runtime.fuzz.campaign import CampaignResult, fuzz
from ember.runtime.fuzz.generate import generate
from ember.runtime.fuzz.program import Program, render_function
from ember.runtime.fuzz.run import Finding, run_program
from ember.runtime.fuzz.shrink import reproducer_source, shrink, write_reproducer

__all__ = [
    "CampaignResult",
    "Finding",
    "Program",
    "fuzz",
    "generate",
    "render_function",
    "reproducer_source",
    "run_program",
    "shrink",
    "write_reproducer",
]
