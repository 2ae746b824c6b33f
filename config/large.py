# A ~1.3B GPT (24 layers, 16 heads, 2048 wide, block_size 2048) on one H200, where FP8 and
# activation checkpointing start to matter. bf16 + compile + flex attention + fused AdamW.
#   python train.py --config config/large.py
#   python train.py --config config/large.py --fp8=True
#   python train.py --config config/large.py --grad_checkpointing=selective --batch_size=16
out_dir = "out-large"
data_dir = "data/stdlib_gpt2"
n_layer = 24
n_head = 16
n_embd = 2048
block_size = 2048
batch_size = 8
total_batch_size = 524288          # tokens per step: 32 micro-steps of 8 x 2048 on one GPU
dropout = 0.0
bias = False
learning_rate = 2e-4
min_lr = 2e-5
warmup_iters = 100
max_iters = 2000
eval_interval = 250
eval_tokens = 524288              # validation tokens (256 rows), the same for any launch
log_interval = 1
dtype = "bfloat16"
compile = True
attention = "flex"
fused_adamw = True
packing = True
document_mask = True
fp8 = False
fp8_recipe = "tensorwise"
fp8_min_dim = 1024                  # every block Linear (2048 wide and up); never the output head
grad_checkpointing = "none"
