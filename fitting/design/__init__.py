"""Designing a study to a compute budget: which runs and evaluation points pin its laws down."""
