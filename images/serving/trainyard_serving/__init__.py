"""The serving image: a local server speaking the TF Serving API subset, and the deploy step's client side."""
