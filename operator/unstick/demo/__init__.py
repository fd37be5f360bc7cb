"""unstick.demo"""
