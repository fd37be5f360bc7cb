"""devcluster.demo"""
