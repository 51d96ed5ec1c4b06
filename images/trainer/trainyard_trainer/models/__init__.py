"""Built-in models. A model module exposes `build_model(params, schema) -> keras.Model` returning logits,
and may expose `loss(params)` (default: sparse categorical cross-entropy from logits)."""
