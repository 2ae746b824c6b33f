# GPT-2 124M on one GPU with every speed flag on: bf16 autocast, torch.compile, FlashAttention
# (FA3 varlen where installed, else FlexAttention, with the document mask: packing is on), fused AdamW,
# the output head and cross-entropy fused (no logits kept for the backward), its matmuls in FP8, and every
# block Linear in FP8 with delayed scales, the MLP's GELU and its derivative inside their casts (Hopper or
# Ada; elsewhere add --fp8=False --fp8_head=False).
#   python train.py --config config/fast.py
#   torchrun --standalone --nproc_per_node=8 train.py --config config/fast.py
# Side by side with nanoGPT's own bench.py at the same micro-batch (BENCHMARKS.md, "The GPT-2 family"):
#   python benchmarks/vs_nanogpt.py --nanogpt ../nanoGPT
out_dir = "out-fast"
data_dir = "data/stdlib_gpt2"       # the stdlib sources with the GPT-2 tokenizer, prepared on first use
n_layer = 12
n_head = 12
n_embd = 768
block_size = 1024
batch_size = 64                     # ~32 GB at peak; lower it on smaller GPUs (more micro-steps, same step)
total_batch_size = 524288          # tokens per optimizer step, as GPT-2 / llm.c: 8 micro-steps of 64 x 1024 on one GPU
dropout = 0.0
bias = False
learning_rate = 6e-4
min_lr = 6e-5
warmup_iters = 100
max_iters = 2000
eval_interval = 250
eval_tokens = 524288              # validation tokens (512 rows), the same for any launch
hellaswag = "auto"                  # HellaSwag at each evaluation where data/hellaswag/hellaswag_val.jsonl is
log_interval = 1
dtype = "bfloat16"
compile = True
attention = "auto"                  # the document mask's fastest kernel installed: varlen (FA3) or flex
fused_adamw = True
fused_ce = True                     # the head + cross-entropy as one function: no (tokens, vocab) logits kept
fp8_head = True                     # ... with its three matmuls in float8 (tensorwise scales)
head_kernel = True                  # ... and its softmax pass in our Triton kernels (speedgpt/features/softmax_pass.py)
fp8 = True                          # every block Linear in float8 ...
fp8_recipe = "tensorwise_delayed"   # ... delayed scales from the last steps' amax, speedgpt/features/fp8.py
                                    # (BENCHMARKS.md, FP8)
fp8_min_dim = 768                   # ... at GPT-2 124M's width too (the default 1024 leaves 768 wide in bf16)
fp8_gelu_cast = True                # ... GELU in c_proj's input cast, its derivative in c_fc's gradient cast, one
                                    # Triton pass each: +3.0% tokens/s on one H100 at one step per micro-batch, the
                                    # loss within the seed spread, +3.2% more since its copy is written as words
                                    # (BENCHMARKS.md, "The roofline of a step")
gelu_erf = "fast"                   # ... whose erf is one exp2 and a reciprocal (1.5e-7 off, below a bf16 step):
                                    # +2.4% tokens/s on one H100 at one step per micro-batch; at 124M the loss over
                                    # 20M tokens within the seed spread (BENCHMARKS.md, "The roofline of a step")
fused_ce_chunk = 65536              # one chunk per micro-batch (faster, more memory); with --compile=False give 16384:
                                    # uncompiled, a chunk holds ~4 float32 (chunk, vocab) temporaries
packing = True
document_mask = True
