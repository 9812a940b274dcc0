"""The GPU check's parts (benchmarks/gpu_check.py is the entry point), imports running down this list:
models.py (shapes, tokenizer, random-weight folders), markdown.py, train.py (the scaled paper run,
score B, resume), decode.py and decode_report.py, learning.py (learning_cuda), report.py (gpu_check.md)."""
