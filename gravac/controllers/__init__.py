"""CF controllers: what each step sends and how CFs move between windows."""
from .base import (GAIN_MEASURES, SENT_CANDIDATE, SENT_DENSE, SENT_MIN, Controller, LocalSync,
                   StepPlan, StepRecord, Sync)
from .accordion import Accordion
from .gravac import GraVAC
from .ladder import build_ladder
from .static import Static

__all__ = ["Controller", "LocalSync", "StepPlan", "StepRecord", "Sync", "Static", "GraVAC", "Accordion", "build_ladder",
           "SENT_CANDIDATE", "SENT_MIN", "SENT_DENSE", "GAIN_MEASURES"]
