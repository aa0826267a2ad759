"""What every front end accepts from a robot before the model sees it: the image pixel budget.

The VLA node (`cameras.max_pixels`), the fleet node (`max_pixels`) and `serve` (`cameras.max_pixels`) refuse an
image larger than this many pixels (width x height, read before decoding) unless told otherwise.
"""

# 1920 x 1200: a 1080p or WUXGA colour stream, the largest that robot cameras commonly send (ALOHA's are
# 640 x 480); larger cameras raise it. Decoding happens off the control path, but a bomb still costs a decoder.
MAX_PIXELS = 1920 * 1200
