"""Serving: the SavedModel export for TensorFlow Serving."""
