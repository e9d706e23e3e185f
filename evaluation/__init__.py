"""Evaluation of exported models: TaCL's self-similarity analysis and GLUE-style fine-tuning."""
