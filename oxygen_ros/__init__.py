"""oxygen_ros: run pi0.5-shaped Vision-Language-Action models on ROS 2 robots, one prefill per frame.

The generated interface modules (``oxygen_ros.msg``) are installed by the rosidl pipeline into the
install prefix, which in a development checkout is a different directory from this source tree;
``extend_path`` lets both halves of the package live side by side.
"""

from pkgutil import extend_path

__path__ = extend_path(__path__, __name__)
__version__ = "0.1.0"
