# The stored pretrained backbone (seed0/: record.json, smallcnn.pth; summary.csv), one thread, about ten CPU-minutes:
OMP_NUM_THREADS=1 dml-book experiment pretrain -p n_classes 1500 -p images 10 -p held_out 2 -p epochs 5 -p batch_size 32 \
    -p optimizer adam -p lr 0.003 -p xl_kwargs '{"strength": 0.5}' -p keep_weights true --out-dir results/pretrain
# The same backbone by its own command (found in the cache after the line above, or trained; prints its file and its
# zero-shot R@1 on the study's glyphs-XL test classes, 0.5234; PretrainConfig's defaults, spelled out):
OMP_NUM_THREADS=1 dml-book pretrain --n-classes 1500 --images 10 --held-out 2 --epochs 5 --batch-size 32 --optimizer adam \
    --lr 0.003 --zero-shot
# The first try (sgd/: record only), ImageNet's recipe on all 4,493 classes of four images; it stayed at chance. The
# notebook had no optimizer parameter then (SGD, Nesterov momentum 0.9, weight decay 5e-4, as PretrainConfig's sgd):
OMP_NUM_THREADS=1 dml-book experiment pretrain -p n_classes null -p epochs 3 -p batch_size 64 -p optimizer sgd -p lr 0.05 \
    -p xl_kwargs '{"strength": 0.5}' --out-dir results/pretrain/sgd
