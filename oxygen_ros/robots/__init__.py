"""Between the engine and the front ends: what every robot the package commands goes through, without ROS."""
