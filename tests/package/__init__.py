"""Tests of the package as a whole: import layers, packaging, and the README's examples."""
