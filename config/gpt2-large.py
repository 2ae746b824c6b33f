# GPT-2 774M (gpt2-large: 36 layers, 20 heads, 1280 wide, block_size 1024) on one H200 with the flags measured fastest
# for this size (BENCHMARKS.md, "The GPT-2 family"): config/fast.py's flags, with
# compile_regional (one block compiled, reused) and a micro-batch of 32
#   python train.py --config config/gpt2-large.py
#   torchrun --standalone --nproc_per_node=8 train.py --config config/gpt2-large.py
# Side by side with nanoGPT's own bench.py at the same micro-batch (BENCHMARKS.md, "The GPT-2 family"):
#   python benchmarks/vs_nanogpt.py --nanogpt ../nanoGPT --sizes 774m
# Point data_dir at your corpus (docs/data.md); the stdlib corpus here is ~15M GPT-2 tokens, a first run.
out_dir = "out-gpt2-large"
data_dir = "data/stdlib_gpt2"
n_layer = 36
n_head = 20
n_embd = 1280
block_size = 1024
batch_size = 32                     # 32 x 1024 tokens per micro-batch: 16 micro-steps on one GPU; 53 GB at peak
total_batch_size = 524288          # tokens per optimizer step, as GPT-2 / llm.c (micro-steps derived and printed)
dropout = 0.0
bias = False
learning_rate = 2.5e-4              # GPT-3's (Brown et al. 2020, Table 2.1) for this size
min_lr = 2.5e-5                     # learning_rate / 10
warmup_iters = 700
max_iters = 19073                   # 10B tokens at 524,288 per step, as llm.c's GPT-2 reproductions
eval_interval = 250
eval_tokens = 524288              # validation tokens, the same for any launch
log_interval = 10
dtype = "bfloat16"
compile = True
compile_regional = True             # one block compiled, reused by all: the first step in seconds, not minutes
attention = "auto"                  # the document mask's fastest kernel installed: varlen (FA3) or flex
fused_adamw = True
fused_ce = True                     # the head + cross-entropy fused (no logits kept for the backward)
fp8_head = True                     # ... its three matmuls in float8 (tensorwise scales)
head_kernel = True                  # ... and its softmax pass in our Triton kernels (speedgpt/features/softmax_pass.py)
fp8 = True                          # every block Linear in float8 ...
fp8_recipe = "tensorwise_delayed"   # ... delayed scales from the last steps' amax, speedgpt/features/fp8.py
                                    # (BENCHMARKS.md, FP8)
fp8_gelu_cast = True                # ... GELU in c_proj's input cast, its derivative in c_fc's gradient cast, one
                                    # Triton pass each: +4.0% tokens/s on one H100 at one step per micro-batch
                                    # (BENCHMARKS.md, "The roofline of a step")
gelu_erf = "fast"                   # ... whose erf is one exp2 and a reciprocal (1.5e-7 off, below a bf16 step):
                                    # +1.8% tokens/s on one H100 at one step per micro-batch (four runs
                                    # alternated); at 124M the loss over 20M tokens within the seed spread
                                    # (BENCHMARKS.md, "The roofline of a step")
packing = True
document_mask = True
