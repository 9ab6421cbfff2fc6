"""COMET, the learned MT metric, scored in its own environment (`make comet-env`).

`scoring` is the project's side (the trainer's downstream evaluation calls it); `worker` and
`random_model` run in COMET's side environment as scripts and import nothing of the project;
`requirements.txt` pins that environment. It sits beside the text metrics (`pipelines.text_metrics`),
below the trainer, which scores with it.
"""
