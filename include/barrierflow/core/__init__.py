"""Core: errors, fault points, schema rules: what every layer may use."""
