"""rclpy nodes: the VLA node and the bag replay/record tools used to evaluate it."""
