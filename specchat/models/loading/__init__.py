"""From names to loaded models: Hugging Face loading, the pair, device and dtype, tokenizer compatibility."""
