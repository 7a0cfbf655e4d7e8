"""The model layer: any torch classifier wrapped, trained and loaded as a run.

Modules, one idea each:

- `adapter`: `wrap` / `ModelAdapter` / `create_model`, one interface over timm models and any
  `nn.Module` with explicit layers;
- `recipe`: `train` / `TrainConfig`, the training recipe, and the run folder it writes;
- `train_config`: `TrainConfig` and the `Setting` of each field, from which the command line and
  the sweep config build their training options (no torch);
- `runs`: `Run`, how a trained run is loaded and scores its crops;
- `devices`: `resolve_device`, which device a run uses and how it is prepared;
- `grad_reverse`: the gradient-reversal layer used by the adversaries.
"""
