"""Code that runs inside the prep image: data validation (Great Expectations) and preparation (TFRecord)."""
