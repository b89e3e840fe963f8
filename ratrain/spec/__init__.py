"""What is being trained and on what: model specs, the parallel configuration, the training
platform and the memory model (Eq. 5-10). Depends on nothing else in ratrain."""
