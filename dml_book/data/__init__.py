"Datasets: built-in (no download), the real benchmarks as their archives extract, and your own images (a folder or a CSV)."
from .builtin import *
from .core import *
from .download import DownloadError, Archive, download_url, extract_archive, fetch_archives
from .transforms import *
from .retrieval import *
from .reid import *
from .glyph_products import *
from .folder import *
from .glyph_pretrain import *
from .icons import *
