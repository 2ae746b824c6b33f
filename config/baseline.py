# config/fast.py's model and batch with every speed flag off: float32 without TF32, eager, naive
# attention (the materialised T x T score matrix), PyTorch's default AdamW.
#   python train.py --config config/baseline.py
exec(open("config/fast.py").read())
out_dir = "out-baseline"
dtype = "float32"
tf32 = False
compile = False
attention = "naive"
fused_adamw = False
