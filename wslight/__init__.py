"""wslight: word sensitivity of random features and random attention features (Bombari & Mondelli, ICML 2024)."""

__version__ = "0.1.0"
