"""Training: the loss, the schedule and the optimizer of section 5."""
