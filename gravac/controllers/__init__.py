"""Controllers: what each step sends, how CFs move between windows, and (``Auto``) which
method runs."""
from .base import (GAIN_MEASURES, SENT_CANDIDATE, SENT_DENSE, SENT_MIN, Controller, LocalSync,
                   StepPlan, StepRecord, Sync)
from .accordion import Accordion
from .auto import Auto
from .gravac import GraVAC
from .ladder import build_ladder
from .methods import METHOD_KINDS, Method
from .static import Static

__all__ = ["Controller", "LocalSync", "StepPlan", "StepRecord", "Sync", "Static", "GraVAC",
           "Accordion", "Auto", "Method", "METHOD_KINDS", "build_ladder", "SENT_CANDIDATE",
           "SENT_MIN", "SENT_DENSE", "GAIN_MEASURES"]
