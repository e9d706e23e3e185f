"""The Hugging Face export of a run or checkpoint, its model card, and the check that it loads natively."""
