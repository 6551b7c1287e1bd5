"""What a trained model can do with its context: retrieval probes (probes.py: a fact placed
anywhere in a long context), the loss along the positions (position_loss.py: the held-out loss
a run logs by position band), and a checkpoint's grid of lengths and depths (retrieval.py,
what scripts/eval_long.py prints)."""
