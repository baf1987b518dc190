"""Environments: the contract every environment keeps, and how one is named, checked and adapted.

    base.py      `BaseEnvironment`: reset/step, seeding, the step budget, `on_truncate`
    registry.py  names, `module:Class` and schemes to environments, and back (`make_env`,
                 `describe_env`, `record_environment`)
    checker.py   `check_env`: small named checks of an environment that say what to fix
    params.py    `KEY=VALUE` settings from the command line (`--env-param`, `--reward-param`)
    global_rng.py `GlobalRNGScope`: the global random/numpy state an adapter runs third-party code under
    adapters/    TextArena, reasoning-gym, OpenEnv and Gymnasium (`adapters/gym.py`)
                 environments as workbench environments

Nothing is imported here; `from workbench import BaseEnvironment, make_env, check_env` is the
short form.
"""
