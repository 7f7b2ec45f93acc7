"""gac inside the trainers people run, each module importing only its trainer:

- :mod:`gac.integrations.transformers`: ``GacCallback`` for transformers'
  ``Trainer`` and TRL's trainers;
- :mod:`gac.integrations.trl`: gac.rl's policy-health signals from TRL's
  ``GRPOTrainer`` loss (GacCallback installs them; the micro-batches of one
  optimizer step pooled by ``gac.rl.StepPool``, as in the verl plug-in);
  imports no trainer;
- :mod:`gac.integrations.verl`: an optimizer module for verl's
  ``optim.optimizer_impl`` setting (AdamW gated by GAC), and verl's policy
  loss ``"gac"`` that records gac.rl's signals of each update;
- :mod:`gac.integrations.megatron`: ``attach`` for a Megatron-Core
  optimizer (its step with ready gradients gated; c_t over the full model
  under tensor, pipeline, expert and data parallelism, from Megatron's own
  parameter attributes and groups).

torchtitan, AReaL and prime-rl take ``gac.attach`` on their optimizer in one
line, verl's Megatron workers, slime and NeMo-RL
``gac.integrations.megatron.attach`` (docs/PYTHON.md names the file and
function of each).

Each module here imports its trainer (or is imported by the trainer's own
configuration) and goes through the package's API: ``gac._plan`` checks the
arguments, ``gac.integrations._gacd`` makes gacd's side (the rank-0
Telemetry, the RemoteController of remote mode) the same way for all of
them, and a step target (gac/_targets.py) says what is read and how a step
is skipped. A step target that needs no import of its trainer, and that
``gac.attach`` recognises on its own, lives beside gac/_targets.py instead:
gac/_deepspeed.py (a DeepSpeed engine or ZeRO optimizer, recognised by its
attributes, also gated from a Trainer). docs/ARCHITECTURE.md, "Adding a
trainer integration", has the recipe.
"""
