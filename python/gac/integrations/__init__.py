"""gac inside the trainers people run, each module importing only its trainer:

- :mod:`gac.integrations.transformers`: ``GacCallback`` for transformers'
  ``Trainer`` and TRL's trainers;
- :mod:`gac.integrations.verl`: an optimizer module for verl's
  ``optim.optimizer_impl`` setting (AdamW gated by GAC).

torchtitan, AReaL and prime-rl take ``gac.attach`` on their optimizer in one
line (docs/PYTHON.md names the file and function of each).
"""
