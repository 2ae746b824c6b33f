# Fine-tune OpenAI's GPT-2 124M on Shakespeare (after nanoGPT's config/finetune_shakespeare.py), on one GPU:
#   python data.py --input data_sources/shakespeare --out data/shakespeare_gpt2 --tokenizer gpt2 --val_frac=0.1
#   python train.py --config config/finetune_shakespeare.py
#   python sample.py --out_dir=out-shakespeare --start="ROMEO:"
#   python hf.py export --out_dir=out-shakespeare          # back to Hugging Face: out-shakespeare/hf
# Needs transformers; offline, the gpt2 weights must be in the Hugging Face cache (README, Hugging Face).
# On a CPU (slow: minutes per step): --device=cpu --dtype=float32 --compile=False --block_size=256 --batch_size=2
out_dir = "out-shakespeare"
data_dir = "data/shakespeare_gpt2"  # tiny Shakespeare in 40 parts: 312k GPT-2 tokens train, 26k val
init_from = "gpt2"
# GPT-2 124M's shape, as init_from='gpt2' sets it; written out so that --init_from=resume matches
n_layer = 12
n_head = 12
n_embd = 768
bias = True
activation = "gelu_tanh"
block_size = 1024
dropout = 0.0
# 32,768 tokens per step (4 micro-steps of 8 x 1024 on one GPU): 20 steps are about two passes over the text
batch_size = 8
total_batch_size = 32768
learning_rate = 3e-5                # constant: small, to keep what GPT-2 knows
min_lr = 3e-5
warmup_iters = 0
max_iters = 20
eval_interval = 5
eval_tokens = 32768               # the val split holds about 26k tokens: all of it
log_interval = 1
dtype = "bfloat16"
compile = True
attention = "sdpa"
