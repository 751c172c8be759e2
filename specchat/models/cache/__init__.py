"""The model cache: where it lives, how it is written safely, what it holds, and its listing."""
