"""rlscope: observable reinforcement-learning post-training for language-model policies."""

__version__ = "0.1.0"
