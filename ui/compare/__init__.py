"""The Compare tab: one prompt, 2-4 columns of settings run side by side, each checked against plain decoding."""
