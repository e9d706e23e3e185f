"""The DeepSpeed engine and what it is built from: the device's precision and peak, the ZeRO stage, the DeepSpeed config, the optimizer and schedule."""
