"""m2flow's worker library: simulators, inference, training, algorithms. Uses only m2flow's public API."""
