"""Training the shipped pair: the corpus and held-out prompts (`data`), the training loops,
losses and optimiser (`trainer`) and the two runs the training scripts start (`recipes`)."""
