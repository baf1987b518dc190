"""The run doctor: named checks on each step's batch and metrics, and the findings they make.

    thresholds.py  `DoctorConfig`: every threshold, the config's `doctor` section (imports nothing)
    findings.py    `Finding`, `Evidence` and the per-step statistics (`History`) the checks read
    checks.py      the named checks and `StepDoctor` (what `Trainer.fit` runs each step)
    remedies.py    the settings that address each finding (`REMEDIES`), fitted to the run (`remedy_for`)
    judges.py      judge-hacking, judge-unreliable, judge-failures: the checks of a reward from a model
    judge_stats.py a judge's numbers (ROC AUC, rank correlation, `judge_verdict`), shared with the audit

Low in the layers: it reads batches (`workbench.trajectory`) and nothing above, so the config
holds its thresholds and training runs its checks. Reopening a finished run and diagnosing
it (`diagnose`, `workbench diagnose`) is `workbench.debug.doctor`, above training. Nothing is
imported here: `import workbench.config` reads the thresholds without loading torch.
"""
