"""The GPU check's parts (benchmarks/gpu_check.py is the entry point), layered so that imports run down:

    models.py    the model shapes, the tokenizer, random-weight model folders (downloads nothing)
    markdown.py  what every report section shares (a part that did not finish, number formatting)
    train.py     parts 2 to 4: the scaled paper configuration, the phase meter, train_shape, score B, resume
    decode.py    part 6: the CUDA-graph decode loop against the eager loop and its arms
    decode_report.py  part 6's report section
    learning.py  part 7: the learning benchmark's rows trained on the device, and its report section
    report.py    gpu_check.json and gpu_check.md from every part's section; `resummarize`

A module imports only those above it in this list (tests/test_layout.py checks benchmarks/ for cycles).
"""
