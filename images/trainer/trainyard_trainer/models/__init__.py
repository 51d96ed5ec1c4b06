"""Built-in models, and the helpers a model module of your own may use (`trainyard_trainer.models.layers`).

A model module exposes `build_model(params, schema) -> keras.Model`: `params` is `training.model.params`,
`schema` a `trainyard_trainer.model_schema.ModelSchema`; the model takes the inputs `layers.model_inputs(schema)`
makes and returns logits (classification) or predictions (regression). Optional, with defaults per task:
`loss(params, schema)` (a per-example Keras loss: reduction "none"), `optimizer(params, learning_rate)`, and
`metrics(params, schema)` (extra Keras metrics evaluate reports, fed the probabilities or predictions).
"""
