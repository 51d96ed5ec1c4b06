"""Code that runs inside the trainer image: distributed TensorFlow training and the SavedModel export."""
