"""The pure rules the recurrent mixers run: no parameters, no collectives.

    gated_delta.py   the gated delta rule in chunks (Gated DeltaNet), and its block summaries
    ssd.py           Mamba2's SSD rule in chunks
    short_conv.py    the causal depthwise convolution both layers start with
"""
