"""Hooks inside other trainers that write what the workbench reads while they train.

    trl.py   `WorkbenchCallback`: a TRL `TrainerCallback` that appends each GRPOTrainer step to a
             workbench run folder (metrics as they are logged, each step's completions as a batch)

Layer: with `compat` (above the debugger: it writes through `workbench.importers`). Nothing in
the core imports it; it imports its trainer only when used.
"""
