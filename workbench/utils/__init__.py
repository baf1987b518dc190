"""Small helpers that import nothing else of workbench, so any layer may use them.

    imports.py   `module:attr` strings to objects and back (`import_object`, `import_path`)
    timeouts.py  `call_with_timeout`: a call with a deadline, in a thread that can be unwound
    progress.py  progress bars for `fit`, rollouts and evaluation, on or off by `training.progress`
    files.py     `write_text`: a run's small text files, with a failed write naming the file
    settings.py  `ConfigError`, and `StrictFields`: settings dataclasses that refuse a misspelled field
"""
