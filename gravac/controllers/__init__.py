"""CF controllers: what each step sends and how CFs move between windows."""
from .base import (SENT_CANDIDATE, SENT_DENSE, SENT_MIN, Controller, LocalSync, StepPlan,
                   StepRecord, Sync)
from .static import Static

__all__ = ["Controller", "LocalSync", "StepPlan", "StepRecord", "Sync", "Static",
           "SENT_CANDIDATE", "SENT_MIN", "SENT_DENSE"]
