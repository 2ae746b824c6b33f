# config/fast.py's model, data and batch with every speed flag off: float32 without TF32, eager,
# naive attention (the materialised T x T score matrix), PyTorch's default AdamW.
#   python train.py --config config/baseline.py
out_dir = "out-baseline"
data_dir = "data/stdlib_gpt2"
n_layer = 12
n_head = 12
n_embd = 768
block_size = 1024
batch_size = 16
total_batch_size = 524288          # 32 micro-steps of 16 x 1024 on one GPU
dropout = 0.0
bias = False
learning_rate = 6e-4
min_lr = 6e-5
warmup_iters = 100
max_iters = 2000
eval_interval = 250
eval_tokens = 524288              # validation tokens (512 rows), the same for any launch
log_interval = 1
packing = True
document_mask = True
# the speed flags, all off
dtype = "float32"
tf32 = False
compile = False
attention = "naive"
fused_adamw = False
