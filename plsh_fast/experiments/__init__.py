"""Experiments that need torch: ``plsh train-lm`` (:mod:`.train_lm`)."""
