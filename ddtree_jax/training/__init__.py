"""Training the shipped pair: the corpus and held-out prompts (`data`) and the training loops,
losses and optimiser (`trainer`)."""
